//! The JIT-compiled unit loop nests of the int8 and f32 GEMMs against the interpreted ones:
//! bit-identical outputs for every kernel this CPU runs, on awkward shapes (K spanning several
//! f32 K blocks), with column-chunked epilogues and row-wide (LayerNorm) ones, on one and two
//! threads.

mod common;
use codegen::jit::{compile_unit, UnitShape};
use codegen::kernels::f32::{gemm_f32_jit, jit_unit as f32_jit_unit};
use codegen::kernels::int8::{gemm_i8_jit, gemm_i8_with, jit_unit, Activations, PackedI8};
use codegen::kernels::{
    gemm_f32, Epilogue, EpilogueOp, Int8Kernel, Output, PackedF32, QType, RowParam,
};
use common::Rng;

/// Every int8 kernel this CPU runs, AMX included: its plain microkernel runs on the tiles the
/// driver configured for the thread, as the interpreted nest's does.
fn kernels(test: &str) -> Vec<Int8Kernel> {
    common::coverage::int8(test)
}

/// Runs `m × k × n` both ways with `ops(bias, gamma, beta)` as the epilogue after the dequant.
fn compare(kernel: Int8Kernel, m: usize, k: usize, n: usize, layer_norm: bool, threads: usize) {
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ (m * 7919 + k * 131 + n) as u64);
    let w: Vec<i8> = (0..k * n).map(|_| rng.i8()).collect();
    let a: Vec<u8> = (0..m * k).map(|_| rng.u8()).collect();
    let w_scale: Vec<f32> = (0..n).map(|_| 0.001 + rng.f32().abs() * 0.01).collect();
    let bias = rng.vec_f32(n);
    let gamma = rng.vec_f32(n);
    let beta = rng.vec_f32(n);
    let b = PackedI8::pack_for(kernel, &w, k, n, n, false).unwrap();
    let mut ops = vec![
        EpilogueOp::Dequant {
            a_scale: RowParam::PerTensor(0.02),
            a_zero: RowParam::PerTensor(7),
            w_scale: &w_scale,
        },
        EpilogueOp::Bias(&bias),
    ];
    if layer_norm {
        ops.push(EpilogueOp::LayerNorm {
            gamma: &gamma,
            beta: &beta,
            eps: 1e-12,
        });
    }
    ops.push(EpilogueOp::Requant {
        scale: 0.05,
        zero_point: 3,
        ty: QType::U8,
    });
    let ep = Epilogue::new(ops);
    let unit = jit_unit(&b, layer_norm, 1).unwrap_or_else(|e| panic!("{}: {e}", kernel.name()));
    let (mut interpreted, mut jitted) = (vec![0u8; m * n], vec![1u8; m * n]);
    gemm_i8_with(
        kernel,
        m,
        Activations::U8(&a),
        k,
        &b,
        Output::U8 {
            c: &mut interpreted,
            ldc: n,
        },
        &ep,
        threads,
    )
    .unwrap();
    let ran = gemm_i8_jit(
        m,
        Activations::U8(&a),
        k,
        &b,
        Output::U8 {
            c: &mut jitted,
            ldc: n,
        },
        &ep,
        threads,
        &unit,
    )
    .unwrap();
    assert!(ran, "{}: the compiled unit did not run", kernel.name());
    assert!(
        interpreted == jitted,
        "{} m={m} k={k} n={n} layer_norm={layer_norm} threads={threads}: JIT differs",
        kernel.name()
    );
}

#[test]
fn jit_units_match_the_interpreted_nest_bit_for_bit() {
    for kernel in kernels("jit_units_match_the_interpreted_nest_bit_for_bit") {
        for &(m, k, n) in &[
            (1, 4, 1),
            (7, 33, 50),
            (17, 64, 97),
            (130, 768, 200),
            (64, 3072, 96),
            (9, 1000, 1300),
        ] {
            for layer_norm in [false, true] {
                for threads in [1, 2] {
                    compare(kernel, m, k, n, layer_norm, threads);
                }
            }
        }
    }
}

#[test]
fn units_are_cached_by_shape_and_kernel() {
    let kernel = kernels("units_are_cached_by_shape_and_kernel")[0];
    let w = vec![1i8; 96 * 40];
    let b = PackedI8::pack_for(kernel, &w, 96, 40, 40, false).unwrap();
    let first = jit_unit(&b, false, 1).unwrap();
    let again = jit_unit(&b, false, 1).unwrap();
    assert_eq!(first.f as usize, again.f as usize, "compiled twice");
    assert_eq!(first.compile_time, again.compile_time);
    let deeper = PackedI8::pack_for(kernel, &vec![1i8; 192 * 40], 192, 40, 40, false).unwrap();
    let other = jit_unit(&deeper, false, 1).unwrap();
    assert_ne!(first.f as usize, other.f as usize);
    assert_eq!(other.shape.k_pad, 192);
}

#[test]
fn a_unit_for_another_shape_is_not_used() {
    // A unit compiled for K = 96 handed to a GEMM with K = 200: the driver runs the interpreted
    // nest (a unit with the wrong strides would read outside the panels).
    let kernel = kernels("a_unit_for_another_shape_is_not_used")[0];
    let (m, k, n) = (13, 200, 70);
    let mut rng = Rng(5);
    let w: Vec<i8> = (0..k * n).map(|_| rng.i8()).collect();
    let a: Vec<u8> = (0..m * k).map(|_| rng.u8()).collect();
    let b = PackedI8::pack_for(kernel, &w, k, n, n, false).unwrap();
    let small = PackedI8::pack_for(kernel, &vec![0i8; 96 * n], 96, n, n, false).unwrap();
    let wrong = jit_unit(&small, false, 1).unwrap();
    let ws = vec![1.0f32; n];
    let ep = Epilogue::new(vec![EpilogueOp::Dequant {
        a_scale: RowParam::PerTensor(1.0),
        a_zero: RowParam::PerTensor(0),
        w_scale: &ws,
    }]);
    let (mut want, mut got) = (vec![0f32; m * n], vec![0f32; m * n]);
    gemm_i8_with(
        kernel,
        m,
        Activations::U8(&a),
        k,
        &b,
        Output::F32 {
            c: &mut want,
            ldc: n,
        },
        &ep,
        1,
    )
    .unwrap();
    let ran = gemm_i8_jit(
        m,
        Activations::U8(&a),
        k,
        &b,
        Output::F32 {
            c: &mut got,
            ldc: n,
        },
        &ep,
        1,
        &wrong,
    )
    .unwrap();
    assert!(!ran, "a unit for K = 96 ran on K = 200");
    assert_eq!(want, got);
}

/// One call a compiled unit made: a microkernel call `(kc4, a, b, c, ldc, next)` or an epilogue
/// call `(ip, p0, p1)`, as addresses and integers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Call {
    Kernel([usize; 6]),
    Epilogue([usize; 3]),
}

std::thread_local! {
    static CALLS: std::cell::RefCell<Vec<Call>> = const { std::cell::RefCell::new(Vec::new()) };
}

extern "C" fn record_kernel(
    kc4: usize,
    a: *const u8,
    b: *const i8,
    c: *mut i32,
    ldc: usize,
    next: *const i8,
) {
    let call = [kc4, a as usize, b as usize, c as usize, ldc, next as usize];
    CALLS.with_borrow_mut(|v| v.push(Call::Kernel(call)));
}

extern "C" fn record_epilogue(_: *mut std::ffi::c_void, ip: usize, p0: usize, p1: usize) {
    CALLS.with_borrow_mut(|v| v.push(Call::Epilogue([ip, p0, p1])));
}

/// A compiled unit makes exactly the calls `UnitFn` documents, in order, prefetch hints included
/// (which change no result, so the bit-for-bit tests above cannot see them): a recording
/// microkernel and epilogue against the documented nest, for hint ranges that run out in the
/// second row, last past the unit, or are empty.
#[test]
fn a_compiled_unit_makes_the_documented_calls() {
    let shape = UnitShape {
        mr: 8,
        nr: 48,
        k_pad: 96,
        // u16 activations (the AVX2 kernel's): A micro-panels twice as far apart as K.
        a_row_bytes: 2 * 96,
        ldacc: 5 * 48,
    };
    let unit = compile_unit(shape, record_kernel, record_epilogue).expect("the JIT on this host");
    let (a, b, acc) = (0x10_0000usize, 0x20_0000usize, 0x30_0000usize);
    let (rows, pan_start, pan_end, chunk): (usize, usize, usize, usize) = (21, 3, 8, 2);
    let line_block = 16 * shape.k_pad; // k_pad / 4 lines of 64 bytes
    for next_len in [0, 1, 3 * line_block, 2 * line_block + 5, 100 * line_block] {
        let next = 0x40_0000usize;
        let mut want = Vec::new();
        let mut cursor = next;
        for ip in 0..rows.div_ceil(shape.mr) {
            let mut p0 = pan_start;
            while p0 < pan_end {
                let p1 = (p0 + chunk).min(pan_end);
                for p in p0..p1 {
                    let hint = if ip > 0 && cursor < next + next_len {
                        cursor += line_block;
                        cursor - line_block
                    } else {
                        0
                    };
                    want.push(Call::Kernel([
                        shape.k_pad / 4,
                        a + ip * shape.mr * shape.a_row_bytes,
                        b + p * shape.k_pad * shape.nr,
                        acc + (p - p0) * shape.nr * 4,
                        shape.ldacc,
                        hint,
                    ]));
                }
                want.push(Call::Epilogue([ip, p0, p1]));
                p0 = p1;
            }
        }
        CALLS.with_borrow_mut(|v| v.clear());
        // SAFETY: the recording callbacks dereference nothing; every address is only recorded.
        unsafe {
            (unit.f)(
                a as *const u8,
                b as *const i8,
                acc as *mut i32,
                std::ptr::null_mut(),
                rows,
                pan_start,
                pan_end,
                chunk,
                next as *const i8,
                next_len,
            )
        };
        let got = CALLS.with_borrow_mut(std::mem::take);
        assert_eq!(got, want, "next_len = {next_len}");
        let hints = got
            .iter()
            .filter(|c| matches!(c, Call::Kernel(k) if k[5] != 0))
            .count();
        assert_eq!(
            hints,
            next_len.div_ceil(line_block).min(10),
            "next_len = {next_len}"
        );
    }
}

#[test]
fn a_malformed_shape_is_refused() {
    extern "C" fn nothing(
        _: usize,
        _: *const u8,
        _: *const i8,
        _: *mut i32,
        _: usize,
        _: *const i8,
    ) {
    }
    extern "C" fn no_epilogue(_: *mut std::ffi::c_void, _: usize, _: usize, _: usize) {}
    let bad = UnitShape {
        mr: 0,
        nr: 16,
        k_pad: 64,
        a_row_bytes: 64,
        ldacc: 16,
    };
    assert!(compile_unit(bad, nothing, no_epilogue).is_err());
}

#[test]
fn f32_jit_units_match_the_interpreted_nest_bit_for_bit() {
    for kernel in common::coverage::f32("f32_jit_units_match_the_interpreted_nest_bit_for_bit") {
        for &(m, k, n) in &[
            (1, 1, 1),
            (7, 33, 50),
            (17, 300, 97),
            (130, 768, 200),
            (9, 2000, 70),
        ] {
            let mut rng = Rng(0xF32 ^ (m * 31 + k * 7 + n) as u64);
            let w = rng.vec_f32(k * n);
            let a = rng.vec_f32(m * k);
            let bias = rng.vec_f32(n);
            let gamma = rng.vec_f32(n);
            let beta = rng.vec_f32(n);
            let b = PackedF32::pack_strided(kernel, &w, k, n, n, false);
            let unit = f32_jit_unit(&b).unwrap_or_else(|e| panic!("{}: {e}", kernel.name()));
            for layer_norm in [false, true] {
                let mut ops = vec![EpilogueOp::Bias(&bias)];
                if layer_norm {
                    ops.push(EpilogueOp::LayerNorm {
                        gamma: &gamma,
                        beta: &beta,
                        eps: 1e-5,
                    });
                }
                let ep = Epilogue::new(ops);
                for threads in [1, 2] {
                    let (mut want, mut got) = (vec![0f32; m * n], vec![1f32; m * n]);
                    gemm_f32(m, &a, k, &b, &mut want, n, &ep, threads);
                    let ran = gemm_f32_jit(m, &a, k, &b, &mut got, n, &ep, threads, &unit);
                    let ctx = format!(
                        "{} m={m} k={k} n={n} ln={layer_norm} threads={threads}",
                        kernel.name()
                    );
                    assert!(ran, "{ctx}: the compiled unit did not run");
                    assert!(
                        want.iter()
                            .zip(&got)
                            .all(|(x, y)| x.to_bits() == y.to_bits()),
                        "{ctx}: JIT differs"
                    );
                }
            }
        }
    }
}

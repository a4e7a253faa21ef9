//! INT8 GEMM: every kernel this CPU runs, plus AMX through the tile model, against a naive i64
//! triple loop (bit-exact i32) and the scalar kernel; extreme values; long K.

mod common;
use codegen::kernels::int8::{
    gemm_i8_amx_model, gemm_i8_avxvnni_evex_twin, gemm_i8_with, Activations, PackedI8,
};
use codegen::kernels::{AlignedBuf, Epilogue, Int8Kernel, Output};
use common::Rng;
use proptest::prelude::*;

/// The int8 kernels this CPU runs, listed in the test output (see [`common::coverage`]).
pub fn kernels(test: &str) -> Vec<Int8Kernel> {
    common::coverage::int8(test)
}

/// Naive Σ a·b in i64 over unpacked data.
#[allow(clippy::too_many_arguments)]
fn oracle(
    m: usize,
    n: usize,
    k: usize,
    a: &[i32],
    lda: usize,
    b: &[i8],
    ldb: usize,
    bt: bool,
) -> Vec<i64> {
    let mut c = vec![0i64; m * n];
    for i in 0..m {
        for j in 0..n {
            let mut s = 0i64;
            for kk in 0..k {
                let bv = if bt { b[j * ldb + kk] } else { b[kk * ldb + j] };
                s += a[i * lda + kk] as i64 * bv as i64;
            }
            c[i * n + j] = s;
        }
    }
    c
}

struct Case {
    m: usize,
    n: usize,
    k: usize,
    signed: bool,
    bt: bool,
    pad: usize,
    a_u8: Vec<u8>,
    a_s8: Vec<i8>,
    b: Vec<i8>,
    /// The u8 activations again, on a cache line (see [`Case::cache_aligned`]).
    a_aligned: Option<AlignedBuf<u8>>,
}

impl Case {
    fn random(m: usize, n: usize, k: usize, signed: bool, bt: bool, pad: usize, seed: u64) -> Self {
        let mut r = Rng(seed | 1);
        let lda = k + pad;
        let ldb = if bt { k } else { n } + pad;
        let a_u8: Vec<u8> = (0..m * lda).map(|_| r.u8()).collect();
        let a_s8: Vec<i8> = a_u8.iter().map(|&v| v as i8).collect();
        let b: Vec<i8> = (0..if bt { n * ldb } else { k * ldb })
            .map(|_| r.i8())
            .collect();
        Case {
            m,
            n,
            k,
            signed,
            bt,
            pad,
            a_u8,
            a_s8,
            b,
            a_aligned: None,
        }
    }
    /// The case with its u8 activations on a 64-byte boundary (the system allocator of this
    /// test binary puts a `Vec` 16 bytes past one).
    fn cache_aligned(mut self) -> Self {
        let mut buf = AlignedBuf::<u8>::zeroed(self.a_u8.len());
        buf.copy_from_slice(&self.a_u8);
        assert_eq!(buf.as_ptr() as usize % 64, 0);
        self.a_aligned = Some(buf);
        self
    }
    fn lda(&self) -> usize {
        self.k + self.pad
    }
    fn ldb(&self) -> usize {
        (if self.bt { self.k } else { self.n }) + self.pad
    }
    fn act(&self) -> Activations<'_> {
        match (&self.a_aligned, self.signed) {
            (_, true) => Activations::S8(&self.a_s8),
            (Some(a), false) => Activations::U8(a),
            (None, false) => Activations::U8(&self.a_u8),
        }
    }
    fn want(&self) -> Vec<i64> {
        let a: Vec<i32> = if self.signed {
            self.a_s8.iter().map(|&v| v as i32).collect()
        } else {
            self.a_u8.iter().map(|&v| v as i32).collect()
        };
        oracle(
            self.m,
            self.n,
            self.k,
            &a,
            self.lda(),
            &self.b,
            self.ldb(),
            self.bt,
        )
    }
    /// Runs `runner` and returns the i32 output (ldc = n + 1).
    fn run(&self, runner: Runner, threads: usize) -> Vec<i32> {
        let pk = match runner {
            Runner::Hw(k) => k,
            Runner::AmxTileModel => Int8Kernel::Amx,
            Runner::AvxVnniEvexTwin => Int8Kernel::AvxVnni,
        };
        let packed = PackedI8::pack_for(pk, &self.b, self.k, self.n, self.ldb(), self.bt).unwrap();
        let ldc = self.n + 1;
        let mut c = vec![i32::MIN; self.m * ldc];
        let out = Output::I32 { c: &mut c, ldc };
        let (act, lda, ep) = (self.act(), self.lda(), Epilogue::none());
        match runner {
            Runner::Hw(k) => gemm_i8_with(k, self.m, act, lda, &packed, out, &ep, threads).unwrap(),
            Runner::AvxVnniEvexTwin => {
                gemm_i8_avxvnni_evex_twin(self.m, act, lda, &packed, out, &ep, threads).unwrap()
            }
            Runner::AmxTileModel => {
                let dots = gemm_i8_amx_model(self.m, act, lda, &packed, out, &ep, threads).unwrap();
                let expect =
                    self.m.div_ceil(32) * self.n.div_ceil(32) * 4 * self.k.max(1).div_ceil(64);
                assert_eq!(
                    dots, expect,
                    "AMX tiling issued the wrong number of tdpbusd"
                );
            }
        }
        c
    }
    fn check(&self, runner: Runner, threads: usize) {
        codegen::kernels::pool::set_min_parallel_macs(0);
        let got = self.run(runner, threads);
        let want = self.want();
        let ldc = self.n + 1;
        let name = runner.name();
        for i in 0..self.m {
            for j in 0..self.n {
                assert_eq!(
                    got[i * ldc + j] as i64,
                    want[i * self.n + j],
                    "{name} m={} n={} k={} s8={} bt={} t={threads}: c[{i},{j}]",
                    self.m,
                    self.n,
                    self.k,
                    self.signed,
                    self.bt
                );
            }
            assert_eq!(got[i * ldc + self.n], i32::MIN, "{name} wrote past n");
        }
    }
}

/// How a case is run: a kernel on this CPU, or a kernel this CPU lacks through its stand-in.
#[derive(Clone, Copy)]
enum Runner {
    Hw(Int8Kernel),
    /// The AMX kernel on the software model of the tile registers.
    AmxTileModel,
    /// The AVX-VNNI kernel through the EVEX encoding of the same instruction.
    AvxVnniEvexTwin,
}

impl Runner {
    fn name(self) -> &'static str {
        match self {
            Runner::Hw(k) => k.name(),
            Runner::AmxTileModel => "amx(tile model)",
            Runner::AvxVnniEvexTwin => "avxvnni(evex twin)",
        }
    }
}

/// Whether the AVX-VNNI kernel can run here through its EVEX twin; says so loudly when not.
fn evex_twin_available(test: &str) -> bool {
    common::coverage::evex_twin(test)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: common::proptest_cases(32), ..ProptestConfig::default() })]
    #[test]
    fn int8_kernels_bit_exact(m in 1usize..=300, n in 1usize..=300, k in 0usize..=300, signed: bool, bt: bool, threads in 1usize..=2, pad in 0usize..3, seed: u64) {
        codegen::kernels::pool::set_min_parallel_macs(0);
        let c = Case::random(m, n, k, signed, bt, pad, seed);
        for kern in kernels("int8_kernels_bit_exact") {
            c.check(Runner::Hw(kern), threads);
        }
    }

    #[test]
    fn amx_tile_model_bit_exact(m in 1usize..=300, n in 1usize..=300, k in 0usize..=300, signed: bool, bt: bool, pad in 0usize..3, threads in 1usize..=2, seed: u64) {
        codegen::kernels::pool::set_min_parallel_macs(0);
        Case::random(m, n, k, signed, bt, pad, seed).check(Runner::AmxTileModel, threads);
    }

    #[test]
    fn avxvnni_evex_twin_bit_exact(m in 1usize..=300, n in 1usize..=300, k in 0usize..=300, signed: bool, bt: bool, pad in 0usize..3, threads in 1usize..=2, seed: u64) {
        if evex_twin_available("avxvnni_evex_twin_bit_exact") {
            Case::random(m, n, k, signed, bt, pad, seed).check(Runner::AvxVnniEvexTwin, threads);
        }
    }
}

#[test]
fn int8_awkward_shapes_all_kernels() {
    codegen::kernels::pool::set_min_parallel_macs(0);
    for &(m, n, k) in &[
        (1, 1, 0),
        (5, 7, 0),
        (1, 1, 1),
        (1, 1, 3),
        (13, 33, 17),
        (12, 32, 64),
        (33, 31, 65),
        (64, 64, 300),
        (5, 100, 4),
        (100, 5, 129),
    ] {
        let c = Case::random(
            m,
            n,
            k,
            m % 2 == 0,
            n % 2 == 0,
            1,
            (m * 1000 + n * 10 + k) as u64,
        );
        for kern in kernels("int8_awkward_shapes_all_kernels") {
            for t in 1..=2 {
                c.check(Runner::Hw(kern), t);
            }
        }
        c.check(Runner::AmxTileModel, 2);
        if evex_twin_available("int8_awkward_shapes_all_kernels") {
            c.check(Runner::AvxVnniEvexTwin, 2);
        }
    }
}

/// u8 rows at stride K (a multiple of the kernel's K alignment: 64 for AMX, 4 for AVX512-VNNI),
/// on a cache line, are the row-major A layout: whole micro-panels are read in place and only
/// the units holding the last, partial one are packed (off a cache line everything is packed).
/// Row counts around the micro-panels (32 rows AMX, 8 VNNI) and the 64-row unit, on the tile
/// model and the hardware kernels that read rows (AMX where present, AVX512-VNNI).
#[test]
fn row_major_kernels_read_unpadded_rows_in_place() {
    codegen::kernels::pool::set_min_parallel_macs(0);
    let hw: Vec<Int8Kernel> = kernels("row_major_kernels_read_unpadded_rows_in_place")
        .into_iter()
        .filter(|k| matches!(k, Int8Kernel::Amx | Int8Kernel::Avx512Vnni))
        .collect();
    for &k in &[52usize, 64, 128, 768] {
        for &m in &[
            1usize, 7, 8, 9, 31, 32, 33, 63, 64, 65, 95, 96, 97, 200, 1000,
        ] {
            for &(n, bt) in &[(32usize, true), (70, false)] {
                let plain = Case::random(m, n, k, false, bt, 0, (m * 7 + n + k) as u64);
                let aligned = Case::random(m, n, k, false, bt, 0, (m * 5 + n + k) as u64);
                for c in [plain, aligned.cache_aligned()] {
                    for t in 1..=2 {
                        c.check(Runner::AmxTileModel, t);
                        for &kern in &hw {
                            c.check(Runner::Hw(kern), t);
                        }
                    }
                }
            }
        }
    }
}

fn extreme_case(m: usize, n: usize, k: usize, av: u8, bv: i8, signed: bool) -> Case {
    let mut c = Case::random(m, n, k, signed, true, 0, 1);
    c.a_u8.iter_mut().for_each(|v| *v = av);
    c.a_s8.iter_mut().for_each(|v| *v = av as i8);
    c.b.iter_mut().for_each(|v| *v = bv);
    c
}

#[test]
fn int8_extremes_no_saturation() {
    codegen::kernels::pool::set_min_parallel_macs(0);
    // 255·(−128) everywhere is what saturates a naive vpmaddubsw kernel.
    for (av, bv, signed) in [
        (255u8, -128i8, false),
        (255, 127, false),
        (0x80, -128, true),
        (0x7f, 127, true),
        (0x80, 127, true),
    ] {
        let c = extreme_case(20, 40, 1000, av, bv, signed);
        for kern in kernels("int8_extremes_no_saturation") {
            c.check(Runner::Hw(kern), 2);
        }
        c.check(Runner::AmxTileModel, 1);
        if evex_twin_available("int8_extremes_no_saturation") {
            c.check(Runner::AvxVnniEvexTwin, 1);
        }
    }
}

#[test]
fn int8_longest_k() {
    codegen::kernels::pool::set_min_parallel_macs(0);
    // 255 · (−128) · 65536 = −2 139 095 040, the most negative sum that still fits in i32.
    let c = extreme_case(3, 17, 65536, 255, -128, false);
    let want = c.want();
    assert_eq!(want[0], -2_139_095_040);
    for kern in kernels("int8_longest_k") {
        c.check(Runner::Hw(kern), 2);
    }
    if evex_twin_available("int8_longest_k") {
        c.check(Runner::AvxVnniEvexTwin, 2);
    }
    assert!(PackedI8::pack_for(Int8Kernel::Scalar, &vec![0; 65537], 65537, 1, 1, false).is_err());
}

#[test]
fn unsupported_kernel_is_an_error() {
    codegen::kernels::pool::set_min_parallel_macs(0);
    for k in Int8Kernel::ALL {
        if !k.is_supported() {
            let p = PackedI8::pack_for(k, &[1; 4], 4, 1, 1, false).unwrap();
            let mut c = [0i32; 1];
            let r = gemm_i8_with(
                k,
                1,
                Activations::U8(&[1; 4]),
                4,
                &p,
                Output::I32 { c: &mut c, ldc: 1 },
                &Epilogue::none(),
                1,
            );
            assert!(r.is_err(), "{} should be refused", k.name());
        }
    }
}

#[test]
fn kernel_packing_mismatch_is_an_error() {
    codegen::kernels::pool::set_min_parallel_macs(0);
    let p = PackedI8::pack_for(Int8Kernel::Amx, &[1; 64], 64, 1, 1, false).unwrap();
    let mut c = [0i32; 1];
    let r = gemm_i8_with(
        Int8Kernel::Scalar,
        1,
        Activations::U8(&[1; 64]),
        64,
        &p,
        Output::I32 { c: &mut c, ldc: 1 },
        &Epilogue::none(),
        1,
    );
    assert!(matches!(r, Err(codegen::kernels::KernelError::BadArgs(_))));
}

#[test]
fn work_stealing_path_is_exact() {
    codegen::kernels::pool::set_min_parallel_macs(0);
    let _steal = common::EagerSteal::on();
    for &(m, n, k) in &[(1100, 200, 64), (37, 500, 100), (600, 97, 33), (5, 7, 9)] {
        assert!(codegen::kernels::pool::eager_steal());
        let c = Case::random(m, n, k, m % 2 == 1, true, 1, (m + n + k) as u64);
        for kern in kernels("work_stealing_path_is_exact") {
            c.check(Runner::Hw(kern), 2);
        }
    }
}

/// Every kernel the crate has is in `ALL` and in the coverage table, so none can drop out of
/// the tests above unnoticed.
#[test]
fn kernel_list_is_complete() {
    let names: Vec<&str> = Int8Kernel::ALL.iter().map(|k| k.name()).collect();
    assert_eq!(names, common::coverage::INT8_NAMES);
    for n in names {
        assert!(common::coverage::cpu_can_run(n).is_some(), "{n}");
    }
    let ran = kernels("kernel_list_is_complete");
    assert!(
        ran.contains(&Int8Kernel::Scalar),
        "the scalar oracle always runs"
    );
}

/// What `amx::dot_rows` hands each row of 16 sums to.
type Finish<'a> = dyn FnMut(usize, usize, &[i32; 16]) + 'a;

/// `amx::dot_rows` (attention's two products on the tile unit) against the definition: on the
/// tile model with the configuration for its K (any tail of 1-15 quads), and with the one
/// configuration the runtime keeps (K in multiples of 8 quads), and on the hardware tile unit
/// where this CPU has one. u8 rows at the extremes and wider strides than they need; bit-exact.
#[test]
fn amx_dot_rows_equal_their_definition() {
    use codegen::kernels::int8::amx::{dot_rows, dot_rows_config, HwTiles};
    use codegen::kernels::int8::tile_model::{TileModel, TileUnit};
    let mut rng = Rng(29);
    let hw = HwTiles::new().ok();
    if hw.is_none() {
        eprintln!("SKIP hardware half of amx_dot_rows_equal_their_definition: no AMX-INT8 here");
    }
    for &(m, n, steps) in &[
        (16, 32, 16),
        (32, 64, 8),
        (48, 96, 24),
        (16, 32, 5),
        (32, 32, 37),
    ] {
        let (ldl, ldr) = (4 * steps + 7, n + 3);
        let left: Vec<u8> = (0..m * ldl).map(|_| rng.u8()).collect();
        let right: Vec<u32> = (0..steps * ldr).map(|_| rng.next_u64() as u32).collect();
        let want = |i: usize, j: usize| -> i32 {
            (0..steps)
                .map(|s| {
                    let w = right[s * ldr + j].to_le_bytes();
                    (0..4)
                        .map(|q| i32::from(left[i * ldl + 4 * s + q]) * i32::from(w[q] as i8))
                        .sum::<i32>()
                })
                .sum()
        };
        let run = |t: &mut dyn FnMut(&mut Finish)| {
            let mut got = vec![None; m * n];
            t(&mut |i, j, sums| {
                for (c, &s) in sums.iter().enumerate() {
                    assert!(
                        got[i * n + j + c].replace(s).is_none(),
                        "({i}, {}) twice",
                        j + c
                    );
                }
            });
            for i in 0..m {
                for j in 0..n {
                    assert_eq!(
                        got[i * n + j],
                        Some(want(i, j)),
                        "{m}x{n}x{steps} at ({i}, {j})"
                    );
                }
            }
        };
        let mut configs = vec![dot_rows_config(steps)];
        if steps % 8 == 0 {
            configs.push(dot_rows_config(8));
        }
        for cfg in configs {
            let mut model = TileModel::default();
            model.configure(&cfg);
            // SAFETY: m rows of 4·steps bytes at stride ldl, steps rows of n words at ldr.
            run(&mut |f| unsafe {
                dot_rows(
                    &mut model,
                    (left.as_ptr(), ldl),
                    (right.as_ptr(), ldr),
                    steps,
                    [m, n],
                    f,
                )
            });
            let dots = (m / 16) * (n / 32) * 2 * steps.div_ceil(16);
            assert_eq!(model.dot_ops, dots, "tile products of {m}x{n}x{steps}");
            if let Some(mut t) = hw.as_ref().and_then(|_| HwTiles::new().ok()) {
                t.configure(&cfg);
                // SAFETY: as above; the unit was just configured.
                run(&mut |f| unsafe {
                    dot_rows(
                        &mut t,
                        (left.as_ptr(), ldl),
                        (right.as_ptr(), ldr),
                        steps,
                        [m, n],
                        f,
                    )
                });
                t.release();
            }
        }
    }
}

/// `record_unit_cycles` times the units of the GEMMs run inside it, their epilogues apart (what
/// `encore bench --profile` splits per weight GEMM), on every kernel; outside a recording
/// nothing is read. Other tests' GEMMs may count too (the counters are process-wide), so the
/// counts are only asked to move.
#[test]
fn recorded_units_count_their_epilogues() {
    use codegen::kernels::int8::{record_unit_cycles, unit_cycles_so_far};
    let (m, n, k) = (64, 96, 256);
    let w: Vec<i8> = (0..n * k).map(|i| (i % 7) as i8 - 3).collect();
    let a: Vec<u8> = (0..m * k).map(|i| (i % 251) as u8).collect();
    assert!(unit_cycles_so_far().is_none());
    for kern in kernels("recorded_units_count_their_epilogues") {
        let packed = PackedI8::pack_for(kern, &w, k, n, n, false).unwrap();
        let mut c = vec![0i32; m * n];
        let (before, after) = record_unit_cycles(|| {
            let before = unit_cycles_so_far().unwrap();
            let out = Output::I32 { c: &mut c, ldc: n };
            gemm_i8_with(
                kern,
                m,
                Activations::U8(&a),
                k,
                &packed,
                out,
                &Epilogue::none(),
                1,
            )
            .unwrap();
            (before, unit_cycles_so_far().unwrap())
        });
        let d = after - before;
        assert!(d.units > 0 && d.epilogue > 0, "{}: {d:?}", kern.name());
        assert!(d.epilogue_share().is_some(), "{}", kern.name());
    }
    assert!(unit_cycles_so_far().is_none());
}

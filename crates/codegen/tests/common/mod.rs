//! Shared helpers for the kernel tests.
#![allow(dead_code)]

/// Deterministic xorshift generator (tests must be reproducible without extra deps).
pub struct Rng(pub u64);

impl Rng {
    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }
    /// Uniform in [-1, 1).
    pub fn f32(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
    pub fn u8(&mut self) -> u8 {
        (self.next_u64() >> 56) as u8
    }
    pub fn i8(&mut self) -> i8 {
        (self.next_u64() >> 56) as u8 as i8
    }
    pub fn vec_f32(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.f32()).collect()
    }
}

/// f64 reference of A·B with B given as [k, n] (row stride ldb) or [n, k] when transposed.
/// Returns (value, Σ|a·b|) per element.
#[allow(clippy::too_many_arguments)]
pub fn ref_gemm_f32(
    m: usize,
    n: usize,
    k: usize,
    a: &[f32],
    lda: usize,
    b: &[f32],
    ldb: usize,
    bt: bool,
) -> Vec<(f64, f64)> {
    let mut out = vec![(0.0, 0.0); m * n];
    for i in 0..m {
        for j in 0..n {
            let (mut s, mut sa) = (0f64, 0f64);
            for kk in 0..k {
                let bv = if bt { b[j * ldb + kk] } else { b[kk * ldb + j] } as f64;
                let p = a[i * lda + kk] as f64 * bv;
                s += p;
                sa += p.abs();
            }
            out[i * n + j] = (s, sa);
        }
    }
    out
}

/// Which kernels a test binary runs on this CPU, decided independently of `codegen`'s own
/// detection (`std::arch` feature flags and CPUID), so that a broken `is_supported` or a
/// kernel missing from `ALL` cannot shrink the tested set unnoticed.
///
/// Every skip is written straight to the process's stderr (the harness captures only the
/// print macros, so this shows even when the test passes). With `CI` set, a kernel that this
/// CPU supports but that would not run is a failure, unless it is named in
/// `ENCORE_CI_ALLOW_SKIP` (comma-separated kernel names, for a CI machine whose OS refuses
/// AMX, say): the skip must be asked for.
pub mod coverage {
    use codegen::kernels::{F32Kernel, Int8Kernel};
    use std::io::Write;

    /// CPUID leaf 7 EDX bit 24 (AMX-TILE) and bit 25 (AMX-INT8).
    fn cpuid_amx_int8() -> bool {
        #[cfg(target_arch = "x86_64")]
        {
            // CPUID is available on every x86_64 CPU; leaf 0 gives the highest leaf.
            let max = std::arch::x86_64::__cpuid(0).eax;
            if max < 7 {
                return false;
            }
            let edx = std::arch::x86_64::__cpuid_count(7, 0).edx;
            edx & (1 << 24) != 0 && edx & (1 << 25) != 0
        }
        #[cfg(not(target_arch = "x86_64"))]
        false
    }

    /// The CPU features each kernel needs, by kernel name; `None` for a name this table does
    /// not know (a new kernel must be added here, which the coverage test enforces).
    pub fn cpu_can_run(name: &str) -> Option<bool> {
        #[cfg(target_arch = "x86_64")]
        {
            let avx2 = is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma");
            let avx512 = avx2
                && is_x86_feature_detected!("avx512f")
                && is_x86_feature_detected!("avx512bw")
                && is_x86_feature_detected!("avx512vl");
            Some(match name {
                "scalar" | "f32-scalar" => true,
                "avx2" | "f32-avx2" => avx2,
                "f32-avx512" => avx512,
                "avx512vnni" => avx512 && is_x86_feature_detected!("avx512vnni"),
                "avxvnni" => avx2 && is_x86_feature_detected!("avxvnni"),
                "amx" => cpuid_amx_int8(),
                _ => return None,
            })
        }
        #[cfg(not(target_arch = "x86_64"))]
        Some(matches!(name, "scalar" | "f32-scalar"))
    }

    fn allowed_skips() -> Vec<String> {
        std::env::var("ENCORE_CI_ALLOW_SKIP")
            .unwrap_or_default()
            .split(',')
            .map(|s| s.trim().to_ascii_lowercase())
            .filter(|s| !s.is_empty())
            .collect()
    }

    fn in_ci() -> bool {
        std::env::var_os("CI").is_some_and(|v| !v.is_empty() && v != "false" && v != "0")
    }

    /// Splits `names` (each with codegen's own `is_supported`) into the ones that run and the
    /// ones skipped, writes the list under `test`, and fails in CI on an unasked skip of a
    /// kernel this CPU can run, or on a kernel the table above does not know.
    fn select<K: Copy>(test: &str, all: &[(K, &'static str, bool)]) -> Vec<K> {
        static REPORTED: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());
        let first = {
            let mut r = REPORTED.lock().unwrap_or_else(|e| e.into_inner());
            let first = !r.iter().any(|t| t == test);
            if first {
                r.push(test.to_string());
            }
            first
        };
        let mut ran = vec![];
        let mut skipped = vec![];
        let mut problems = vec![];
        let allowed = allowed_skips();
        for &(k, name, supported) in all {
            let cpu = cpu_can_run(name);
            if supported {
                ran.push((k, name));
                if cpu == Some(false) {
                    problems.push(format!(
                        "{name}: codegen says supported but this CPU lacks its features"
                    ));
                }
                continue;
            }
            match cpu {
                None => problems.push(format!(
                    "{name}: unknown kernel, add it to the coverage table"
                )),
                Some(true) if allowed.iter().any(|a| a == name) => skipped.push(format!(
                    "{name} (this CPU has the instructions, skip allowed by ENCORE_CI_ALLOW_SKIP)"
                )),
                Some(true) => {
                    skipped.push(format!(
                        "{name} (this CPU has the instructions but codegen refuses it)"
                    ));
                    problems.push(format!(
                        "{name}: this CPU has its instructions but codegen does not run it"
                    ));
                }
                Some(false) if name == "amx" => skipped.push(
                    "amx (this CPU lacks AMX-INT8; its tiling runs on the tile model)".to_string(),
                ),
                Some(false) => skipped.push(format!("{name} (this CPU lacks its instructions)")),
            }
        }
        let names: Vec<&str> = ran.iter().map(|r| r.1).collect();
        let line = format!(
            "KERNELS {test}: ran [{}]; skipped [{}]\n",
            names.join(", "),
            skipped.join("; ")
        );
        // Straight to the process's stderr: libtest captures only the print macros. Once per
        // test (a property test asks once per case).
        if first {
            let _ = std::io::stderr().write_all(line.as_bytes());
        }
        if !problems.is_empty() {
            let msg = format!("{test}: {}", problems.join("; "));
            if in_ci() {
                panic!("{msg} (CI: every kernel this CPU supports must run)");
            }
            if first {
                let _ = std::io::stderr().write_all(format!("WARNING {msg}\n").as_bytes());
            }
        }
        ran.into_iter().map(|r| r.0).collect()
    }

    /// The int8 kernels `test` runs on hardware (see the module doc).
    pub fn int8(test: &str) -> Vec<Int8Kernel> {
        let all: Vec<_> = Int8Kernel::ALL
            .into_iter()
            .map(|k| (k, k.name(), k.is_supported()))
            .collect();
        select(test, &all)
    }

    /// The f32 kernels `test` runs (see the module doc).
    pub fn f32(test: &str) -> Vec<F32Kernel> {
        let all: Vec<_> = F32Kernel::ALL
            .into_iter()
            .map(|k| (k, k.name(), k.is_supported()))
            .collect();
        select(test, &all)
    }

    /// Whether the AVX-VNNI kernel's EVEX twin (AVX512-VNNI) can run; a skip says so, and in
    /// CI fails when this CPU has AVX512-VNNI but codegen says otherwise.
    pub fn evex_twin(test: &str) -> bool {
        let ok = codegen::kernels::cpu_features().avx512vnni;
        let cpu = cpu_can_run("avx512vnni") == Some(true);
        if ok != cpu && in_ci() {
            panic!("{test}: codegen says AVX512-VNNI={ok}, the CPU says {cpu}");
        }
        if !ok {
            let _ = std::io::stderr().write_all(
                format!("SKIP {test}: avxvnni through its EVEX twin needs AVX512-VNNI, which this CPU lacks\n")
                    .as_bytes(),
            );
        }
        ok
    }

    /// The names every kernel list must hold: a kernel dropped from `ALL` fails this.
    pub const INT8_NAMES: [&str; 5] = ["scalar", "avx2", "avxvnni", "avx512vnni", "amx"];
    pub const F32_NAMES: [&str; 3] = ["f32-scalar", "f32-avx2", "f32-avx512"];
}

/// Turns the pool's process-wide eager work stealing on for as long as it lives, and off again
/// when dropped (also when the test panics). The guards of one process take turns through a
/// lock, so two stealing tests never toggle the switch under each other. Tests without a guard
/// may run while it is on: they check exact results, which both paths must give.
pub struct EagerSteal(#[allow(dead_code)] std::sync::MutexGuard<'static, ()>);

impl EagerSteal {
    pub fn on() -> EagerSteal {
        static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
        let g = LOCK.lock().unwrap_or_else(|e| e.into_inner());
        codegen::kernels::pool::set_eager_steal(true);
        EagerSteal(g)
    }
}

impl Drop for EagerSteal {
    fn drop(&mut self) {
        codegen::kernels::pool::set_eager_steal(false);
    }
}

/// The number of cases of a property test: `PROPTEST_CASES` when set (so CI or a developer can
/// run more, or fewer), else `default`.
pub fn proptest_cases(default: u32) -> u32 {
    match std::env::var("PROPTEST_CASES") {
        Ok(v) => v
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("PROPTEST_CASES={v:?} is not a number")),
        Err(_) => default,
    }
}

//! Kernel selection, cache sizes, the thread pool, the peak probe and hwbench.

use codegen::kernels::hwbench::{hwbench_with, render_json, render_table};
use codegen::kernels::pool::{parallel_for, parallel_owned_chunks, split_range};
use codegen::kernels::{
    cache_sizes, cpu_features, measure_peak, parse_cache_override, pick_f32, pick_int8, CacheSizes,
    F32Kernel, Int8Kernel, KernelError,
};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

#[test]
fn kernel_names_round_trip() {
    for k in Int8Kernel::ALL {
        assert_eq!(Int8Kernel::parse(k.name()), Ok(k));
        assert_eq!(Int8Kernel::parse(&k.name().to_uppercase()), Ok(k));
    }
    assert_eq!(
        Int8Kernel::parse("avx9"),
        Err(KernelError::UnknownKernel("avx9".into()))
    );
}

#[test]
fn pickers_choose_supported_kernels() {
    for (m, n, k) in [(1, 1, 1), (128, 768, 768), (4096, 3072, 768)] {
        assert!(pick_int8(m, n, k).is_supported());
    }
    assert!(pick_f32().is_supported());
    let f = cpu_features();
    if std::env::var("ENCORE_KERNEL").is_ok() {
        use std::io::Write;
        let _ = std::io::stderr().write_all(
            b"SKIP pickers_choose_supported_kernels automatic choice: ENCORE_KERNEL forces the kernel\n",
        );
    } else {
        if f.avx512vnni && !f.amx_int8 {
            assert_eq!(pick_int8(1024, 768, 768), Int8Kernel::Avx512Vnni);
        }
        if f.avx512 {
            assert_eq!(pick_f32(), F32Kernel::Avx512);
        }
    }
    assert!(Int8Kernel::Scalar.is_supported() && F32Kernel::Scalar.is_supported());
}

#[test]
fn cache_override_parsing() {
    assert_eq!(
        parse_cache_override("32768,1048576"),
        Ok(CacheSizes {
            l1d: 32768,
            l2: 1 << 20
        })
    );
    assert_eq!(
        parse_cache_override(" 48k , 2M "),
        Ok(CacheSizes {
            l1d: 48 << 10,
            l2: 2 << 20
        })
    );
    for bad in ["", "48K", "a,b", "1,2,3", "0,1M"] {
        assert!(
            parse_cache_override(bad).is_err(),
            "{bad:?} should not parse"
        );
    }
    let c = cache_sizes();
    assert!(c.l1d >= 4096 && c.l2 >= c.l1d);
}

#[test]
fn split_range_partitions() {
    for total in 0..50 {
        for parts in 1..5 {
            let mut next = 0;
            for t in 0..parts {
                let r = split_range(total, parts, t);
                assert_eq!(r.start, next);
                assert!(r.len() <= total / parts + 1);
                next = r.end;
            }
            assert_eq!(next, total);
        }
    }
}

#[test]
fn pool_runs_every_part_once_from_many_callers() {
    std::thread::scope(|s| {
        for _ in 0..4 {
            s.spawn(|| {
                for parts in 1..=3 {
                    let hits: Vec<AtomicUsize> = (0..parts).map(|_| AtomicUsize::new(0)).collect();
                    for _ in 0..200 {
                        parallel_for(parts, &|t| {
                            hits[t].fetch_add(1, Ordering::Relaxed);
                        });
                    }
                    assert!(hits.iter().all(|h| h.load(Ordering::Relaxed) == 200));
                }
            });
        }
    });
}

/// Every index in exactly one chunk, each chunk inside one part's share (as `split_range` cuts
/// the shares), whatever the sizes, and from concurrent callers (which then run inline).
#[test]
fn owned_chunks_cover_every_index_once_within_shares() {
    std::thread::scope(|s| {
        for caller in 0..3 {
            s.spawn(move || {
                for parts in 1..=4 {
                    for total in (0..40).chain([97, 1000]) {
                        let hits: Vec<AtomicUsize> =
                            (0..total).map(|_| AtomicUsize::new(0)).collect();
                        let chunks = std::sync::Mutex::new(Vec::new());
                        parallel_owned_chunks(total, parts, |r| {
                            r.clone().for_each(|i| {
                                hits[i].fetch_add(1, Ordering::Relaxed);
                            });
                            chunks.lock().unwrap().push(r);
                        });
                        let at = format!("caller {caller}, {total} in {parts} parts");
                        assert!(hits.iter().all(|h| h.load(Ordering::Relaxed) == 1), "{at}");
                        let used = parts.min(total).max(1);
                        let shares: Vec<_> =
                            (0..used).map(|t| split_range(total, used, t)).collect();
                        for r in chunks.into_inner().unwrap() {
                            assert!(!r.is_empty(), "{at}: an empty chunk");
                            assert!(
                                shares.iter().any(|s| s.start <= r.start && r.end <= s.end),
                                "{at}: chunk {r:?} straddles the shares {shares:?}"
                            );
                        }
                    }
                }
            });
        }
    });
}

#[test]
fn pool_nested_call_runs_inline() {
    let total = AtomicUsize::new(0);
    parallel_for(2, &|_| {
        parallel_for(2, &|t| {
            total.fetch_add(t + 1, Ordering::Relaxed);
        });
    });
    assert_eq!(total.load(Ordering::Relaxed), 6);
}

#[test]
fn pool_propagates_panics_and_recovers() {
    for bad_part in 0..2 {
        let r = std::panic::catch_unwind(|| {
            parallel_for(2, &|t| {
                if t == bad_part {
                    panic!("part {t} fails");
                }
            })
        });
        assert!(
            r.is_err(),
            "a panic in part {bad_part} must reach the caller"
        );
    }
    let n = AtomicUsize::new(0);
    parallel_for(2, &|_| {
        n.fetch_add(1, Ordering::Relaxed);
    });
    assert_eq!(
        n.load(Ordering::Relaxed),
        2,
        "the pool still works after a panic"
    );
}

#[test]
fn peak_and_hwbench() {
    let f = cpu_features();
    let p = measure_peak(1);
    if f.avx512vnni || f.avxvnni || f.avx2_fma {
        // `vpdpbusd`, or on AVX2 without VNNI the `vpmaddwd` loop the AVX2 kernel is held to.
        assert!(p.vnni_ops_per_s > 1e9, "{p:?}");
    } else {
        use std::io::Write;
        // Straight to stderr: the harness hides eprintln! of passing tests.
        let _ = std::io::stderr()
            .write_all(b"SKIP peak_and_hwbench int8 peak: this CPU has neither VNNI nor AVX2\n");
    }
    if f.avx2_fma {
        assert!(p.fma_flops_per_s > 1e9, "{p:?}");
    }
    // The tile unit's peak is measured only where AMX runs, and there it is the int8 peak.
    if Int8Kernel::Amx.is_supported() {
        assert!(p.amx_ops_per_s > p.vnni_ops_per_s, "{p:?}");
        assert_eq!(p.int8_ops_per_s(Int8Kernel::Amx), p.amx_ops_per_s);
    } else {
        assert_eq!(p.amx_ops_per_s, 0.0, "{p:?}");
    }
    assert_eq!(p.int8_ops_per_s(Int8Kernel::Avx512Vnni), p.vnni_ops_per_s);
    let rows = hwbench_with(
        64,
        96,
        128,
        1,
        &p,
        &Int8Kernel::ALL,
        &F32Kernel::ALL,
        Duration::from_millis(5),
    );
    let supported8 = Int8Kernel::ALL.iter().filter(|k| k.is_supported()).count();
    let supportedf = F32Kernel::ALL.iter().filter(|k| k.is_supported()).count();
    assert_eq!(rows.len(), supported8 + supportedf);
    assert_eq!(
        rows.iter()
            .filter(|r| r.picked && r.dtype == "int8")
            .count(),
        1
    );
    assert_eq!(
        rows.iter().filter(|r| r.picked && r.dtype == "f32").count(),
        1
    );
    assert!(rows.iter().all(|r| r.gops > 0.0 && r.seconds > 0.0));
    let table = render_table(&rows);
    assert_eq!(table.lines().count(), rows.len() + 1);
    let json = render_json(&rows);
    assert_eq!(json.matches("\"kernel\"").count(), rows.len());
}

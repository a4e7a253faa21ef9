//! `encore bench --profile`: the per-kind times, the count of standalone elementwise ops
//! that epilogue fusion left inside the layers, and the GEMM work its roofline line rates.

mod common;

use common::{encore, models_dir, quantize_random, quantize_random_with, scratch, stderr, stdout};

fn profile(model: &str, extra: &[&str]) -> serde_json::Value {
    let mut args = vec![
        "bench",
        "--model",
        model,
        "--batch",
        "2",
        "--seq",
        "16",
        "--seconds",
        "0",
        "--min-runs",
        "2",
        "--warmup",
        "0",
        "--profile",
        "--json",
    ];
    args.extend_from_slice(extra);
    let o = encore(&args);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(stdout(&o).trim()).unwrap();
    v["profile"].clone()
}

fn kind_nodes(p: &serde_json::Value, kind: &str) -> u64 {
    p["kinds"]
        .as_array()
        .unwrap()
        .iter()
        .find(|k| k["kind"] == kind)
        .map(|k| k["nodes"].as_u64().unwrap())
        .unwrap_or(0)
}

/// tiny-bert's FP32 ONNX file, or None without the shared models (`models_dir` says the test
/// skips).
fn tiny_bert() -> Option<String> {
    let m = models_dir("bench_profile")?;
    Some(m.join("tiny/bert/model.onnx").to_str().unwrap().to_owned())
}

#[test]
fn fusion_leaves_no_standalone_elementwise_op_in_a_layer() {
    let Some(fp32) = tiny_bert() else {
        return;
    };
    let fp32 = fp32.as_str();
    let layers = 2; // tiny-bert (../shared/models/README.md)

    let fused = profile(fp32, &[]);
    assert_eq!(fused["layers"], layers, "{fused}");
    assert_eq!(fused["elementwise_per_layer"], 0.0, "{fused}");
    // Q, K and V as one GEMM, attention output, FFN1, FFN2 per layer, and the pooler.
    assert_eq!(kind_nodes(&fused, "gemm"), 4 * layers + 1, "{fused}");
    assert!(fused["total_ms"].as_f64().unwrap() > 0.0);
    // The roofline counts the GEMMs' real work: 32 tokens × (128·384 + 128·128 + 128·512 +
    // 512·128) per layer (hidden 128, intermediate 512), and the pooler's 2 rows × 128·128.
    let macs = 32.0 * 196_608.0 * layers as f64 + 2.0 * 128.0 * 128.0;
    assert_eq!(fused["gemm_macs_per_run"], macs, "{fused}");
    assert!(fused["gemm_ops_per_s"].as_f64().unwrap() > 0.0, "{fused}");
    assert_eq!(fused["peak_unit"], "FMA", "{fused}");
    // The epilogue's share is timed in the int8 units only: none in an FP32 program.
    assert!(fused["gemm_epilogue_share"].is_null(), "{fused}");

    // Without fusion the same layers carry their bias, GELU, residual and LayerNorm ops: the
    // counter sees them.
    let unfused = profile(fp32, &["--no-fuse"]);
    assert_eq!(unfused["layers"], layers, "{unfused}");
    let per_layer = unfused["elementwise_per_layer"].as_f64().unwrap();
    assert!(per_layer >= 4.0, "{unfused}");

    // The INT8 program is fused the same way.
    let dir = scratch("bench_profile");
    let int8 = dir.join("tiny-bert.int8.encore");
    quantize_random(std::path::Path::new(fp32), &int8);
    let q = profile(int8.to_str().unwrap(), &[]);
    assert_eq!(q["elementwise_per_layer"], 0.0, "{q}");
    assert_eq!(q["gemm_macs_per_run"], macs, "{q}");
    let unit = q["peak_unit"].as_str().unwrap();
    // `vpmaddwd` on AVX2 CPUs without VNNI (the AVX2 kernel's instruction).
    assert!(
        ["AMX tdpbusd", "vpdpbusd", "vpmaddwd"].contains(&unit),
        "{q}"
    );
    // Rated against the tile unit, a run also gets the roofline, the `vpdpbusd` peak.
    if unit == "AMX tdpbusd" {
        assert!(q["vnni_peak_ops_per_s"].as_f64().unwrap() > 0.0, "{q}");
    } else {
        assert!(q["vnni_peak_ops_per_s"].is_null(), "{q}");
    }
    assert!(
        q["ops"]
            .as_array()
            .unwrap()
            .iter()
            .any(|o| o["op"] == "qlinear"),
        "{q}"
    );

    // Static activations with int8 attention: the QKV GEMM writes quantized heads (2H bytes,
    // scales, H floats), and its work is still tokens × K × 3H. By role, each projection once
    // per layer, and the roles add up to the whole.
    let heads = dir.join("tiny-bert.int8-attn.encore");
    quantize_random_with(
        std::path::Path::new(fp32),
        &heads,
        &["--activations", "static", "--attention", "int8"],
    );
    let h = profile(heads.to_str().unwrap(), &[]);
    assert_eq!(h["gemm_macs_per_run"], macs, "{h}");
    let groups = h["gemm_groups"].as_array().unwrap();
    assert_eq!(groups.len(), 5, "{h}");
    for g in &groups[..4] {
        assert_eq!(g["nodes"], layers, "{g}");
        assert!(g["role"].as_str().unwrap().contains("layer.N"), "{g}");
    }
    // Every int8 GEMM's units timed, the epilogue a part of their time (dequantization, bias,
    // GELU, residual, LayerNorm and the quantized outputs are never free, nor all of it).
    for g in groups {
        let e = g["epilogue_share"].as_f64().unwrap_or(f64::NAN);
        assert!(e > 0.0 && e < 1.0, "{g}");
    }
    let all = h["gemm_epilogue_share"].as_f64().unwrap_or(f64::NAN);
    assert!(all > 0.0 && all < 1.0, "{h}");
    let per_role: f64 = groups.iter().map(|g| g["macs"].as_f64().unwrap()).sum();
    assert_eq!(per_role, macs, "{h}");
    assert_eq!(
        groups[0]["macs"],
        32.0 * 128.0 * 384.0 * layers as f64,
        "{h}"
    );
}

/// The profile counts the parallel regions of a run and what lies between them: none on one
/// thread; on two (where the machine has them), some, and no more time inside them than in
/// the nodes that hold them.
#[test]
fn the_profile_counts_the_hand_offs_between_threads() {
    let Some(fp32) = tiny_bert() else {
        return;
    };
    let fp32 = fp32.as_str();
    let one = profile(fp32, &["--threads", "1"]);
    for key in [
        "regions_per_run",
        "region_ms_per_run",
        "between_regions_ms_per_run",
        "region_spread_ms_per_run",
    ] {
        assert_eq!(one[key], 0.0, "{key}: {one}");
    }
    // One thread works alone all the time: in the nodes, their whole time, op by op.
    let g = |v: &serde_json::Value, key: &str| v[key].as_f64().unwrap();
    let by_op = |v: &serde_json::Value| -> f64 {
        v["alone_by_op"]
            .as_array()
            .unwrap()
            .iter()
            .map(|o| o["ms"].as_f64().unwrap())
            .sum()
    };
    assert!(
        (g(&one, "alone_ms_per_run") - g(&one, "total_ms")).abs() < 1e-6,
        "{one}"
    );
    assert!(
        (by_op(&one) - g(&one, "alone_ms_per_run")).abs() < 1e-9,
        "{one}"
    );
    assert!(g(&one, "wall_ms_per_run") >= g(&one, "total_ms"), "{one}");
    assert!(g(&one, "outside_ops_ms_per_run") >= 0.0, "{one}");
    if std::thread::available_parallelism().map_or(1, |n| n.get()) < 2 {
        eprintln!(
            "SKIP the two-thread half of the_profile_counts_the_hand_offs_between_threads: one CPU"
        );
        return;
    }
    let two = profile(fp32, &["--threads", "2"]);
    let f = |key: &str| two[key].as_f64().unwrap();
    assert!(f("regions_per_run") >= 1.0, "{two}");
    let inside = f("region_ms_per_run");
    assert!(inside > 0.0 && inside <= f("total_ms"), "{two}");
    assert!(f("region_spread_ms_per_run") <= inside, "{two}");
    assert!(f("between_regions_ms_per_run") >= 0.0, "{two}");
    // Alone: the nodes' time less what the regions they dispatched took (no region runs
    // outside a node here), so between the nodes' time less all regions' and the nodes' time.
    let alone = f("alone_ms_per_run");
    assert!(
        alone >= f("total_ms") - inside - 1e-6 && alone <= f("total_ms"),
        "{two}"
    );
    assert!(
        alone < f("total_ms"),
        "two threads: some of the time is in regions: {two}"
    );
    assert!((by_op(&two) - alone).abs() < 1e-9, "{two}");
    assert!(f("wall_ms_per_run") >= f("total_ms"), "{two}");
}

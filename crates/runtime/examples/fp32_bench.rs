//! Times FP32 inference of a model on a synthetic batch and prints a per-op profile.
//!
//! `cargo run --release -p runtime --example fp32_bench -- MODEL.onnx [BATCH] [SEQ] [ITERS] [THREADS] [--no-opt]`

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use runtime::{CompileOptions, DType, Model, Session, TensorValue};

fn main() -> Result<(), runtime::Error> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let path = args
        .first()
        .expect("usage: fp32_bench MODEL.onnx [BATCH] [SEQ] [ITERS] [THREADS] [--no-opt]");
    let num = |i: usize, d: usize| args.get(i).and_then(|s| s.parse().ok()).unwrap_or(d);
    let (batch, seq, iters) = (num(1, 8), num(2, 128), num(3, 10));
    let threads = num(4, CompileOptions::default().threads);
    let optimize = !args.iter().any(|a| a == "--no-opt");
    let model = Model::load(path)?;
    let t = Instant::now();
    let session = Session::new(
        &model,
        CompileOptions {
            threads,
            optimize,
            ..Default::default()
        },
    )?;
    println!("compile: {:.1} ms", t.elapsed().as_secs_f64() * 1e3);
    let feeds: Vec<(String, TensorValue)> = session
        .inputs()
        .into_iter()
        .map(|s| {
            assert_eq!(s.ty.dtype, DType::I64, "synthetic inputs are i64 ids");
            let v: Vec<i64> = (0..batch * seq)
                .map(|i| match s.name.as_str() {
                    "attention_mask" => 1,
                    "token_type_ids" => 0,
                    _ => 5 + (i % 97) as i64,
                })
                .collect();
            (s.name, TensorValue::from_i64(vec![batch, seq], v).unwrap())
        })
        .collect();
    let feeds: Vec<(&str, TensorValue)> =
        feeds.iter().map(|(n, t)| (n.as_str(), t.clone())).collect();
    session.run(&feeds)?;
    let mut by_op: BTreeMap<&str, Duration> = BTreeMap::new();
    let t = Instant::now();
    for _ in 0..iters {
        let (_, times) = session.run_profiled(&feeds)?;
        for nt in times {
            *by_op.entry(nt.op).or_default() += nt.time;
        }
    }
    let per = t.elapsed().as_secs_f64() / iters as f64;
    println!(
        "batch {batch} x seq {seq}, {threads} threads, optimize={optimize}: {:.2} ms/run, {:.0} sequences/s",
        per * 1e3,
        batch as f64 / per
    );
    let mut ops: Vec<_> = by_op.into_iter().collect();
    ops.sort_by_key(|o| std::cmp::Reverse(o.1));
    for (op, d) in ops {
        println!(
            "  {op:<24} {:8.3} ms/run",
            d.as_secs_f64() * 1e3 / iters as f64
        );
    }
    Ok(())
}

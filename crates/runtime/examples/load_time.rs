//! Times what an application pays before its first run: `Model::load`, `Session` build, and the
//! first run (batch 1, 128 tokens), each the median of `--repeat` tries (default 5) in this
//! process, the file in the page cache after the first.
//!
//! ```text
//! cargo run --release -p runtime --example load_time -- /tmp/w7/bert-base.int8.encore [--threads 2] [--repeat 5]
//! ```

use std::time::Instant;

use runtime::{Model, Session, TensorValue};

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() -> Result<(), runtime::Error> {
    let mut args = std::env::args().skip(1);
    let mut path = None;
    let (mut threads, mut repeat) = (2usize, 5usize);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--threads" => threads = args.next().and_then(|v| v.parse().ok()).unwrap_or(2),
            "--repeat" => repeat = args.next().and_then(|v| v.parse().ok()).unwrap_or(5),
            _ => path = Some(a),
        }
    }
    let Some(path) = path else {
        eprintln!("usage: load_time MODEL [--threads N] [--repeat N]");
        std::process::exit(2);
    };
    // Warm the page cache.
    drop(std::fs::read(&path).map_err(|e| runtime::Error::Invalid(format!("{path}: {e}")))?);
    let (mut load, mut build, mut first) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..repeat.max(1) {
        let t = Instant::now();
        let model = Model::load(&path)?;
        load.push(t.elapsed().as_secs_f64());
        let t = Instant::now();
        let session = Session::builder(&model).threads(threads).build()?;
        build.push(t.elapsed().as_secs_f64());
        let seq = 128;
        let feeds: Vec<(String, TensorValue)> = session
            .inputs()
            .into_iter()
            .map(|s| {
                let v = if s.name == "input_ids" {
                    1000
                } else {
                    i64::from(s.name == "attention_mask")
                };
                (
                    s.name,
                    TensorValue::from_i64(vec![1, seq], vec![v; seq]).unwrap(),
                )
            })
            .collect();
        let refs: Vec<(&str, TensorValue)> =
            feeds.iter().map(|(n, t)| (n.as_str(), t.clone())).collect();
        let t = Instant::now();
        session.run(&refs)?;
        first.push(t.elapsed().as_secs_f64());
    }
    println!(
        "{path}: Model::load {:.3} s, Session build {:.3} s, first run (1x128) {:.3} s  (median of {}; {threads} threads)",
        median(load),
        median(build),
        median(first),
        repeat.max(1)
    );
    Ok(())
}
